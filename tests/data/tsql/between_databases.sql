-- Completing a conversation between databases (lessons 1 and 2, retyped): the target database's
-- objects, then the initiator database's. Both define the same message types and contract.
USE master;
GO
ALTER DATABASE InstTargetDB SET ENABLE_BROKER;
GO

USE InstTargetDB;
GO
CREATE MESSAGE TYPE [//BothDB/2DBSample/RequestMessage]
       VALIDATION = WELL_FORMED_XML;
CREATE MESSAGE TYPE [//BothDB/2DBSample/ReplyMessage]
       VALIDATION = WELL_FORMED_XML;
GO

CREATE CONTRACT [//BothDB/2DBSample/SimpleContract]
      ([//BothDB/2DBSample/RequestMessage]
         SENT BY INITIATOR,
       [//BothDB/2DBSample/ReplyMessage]
         SENT BY TARGET
      );
GO

CREATE QUEUE InstTargetDB.dbo.TargetQueue2DB;

CREATE SERVICE [//TgtDB/2DBSample/TargetService]
       ON QUEUE TargetQueue2DB
       ([//BothDB/2DBSample/SimpleContract]);
GO

USE InstInitiatorDB;
GO
CREATE MESSAGE TYPE [//BothDB/2DBSample/RequestMessage]
       VALIDATION = WELL_FORMED_XML;
CREATE MESSAGE TYPE [//BothDB/2DBSample/ReplyMessage]
       VALIDATION = WELL_FORMED_XML;
GO

CREATE CONTRACT [//BothDB/2DBSample/SimpleContract]
      ([//BothDB/2DBSample/RequestMessage]
         SENT BY INITIATOR,
       [//BothDB/2DBSample/ReplyMessage]
         SENT BY TARGET
      );
GO

CREATE QUEUE InstInitiatorDB.dbo.InitiatorQueue2DB;

CREATE SERVICE [//InitDB/2DBSample/InitiatorService]
       ON QUEUE InitiatorQueue2DB;
GO
