/* Using internal activation (the tutorial's lessons 1 and 2, retyped): the conversation
   objects, the activated stored procedure, and ACTIVATION turned on for the target queue. */
USE AdventureWorks2008R2;
GO

CREATE MESSAGE TYPE [//AWDB/InternalAct/RequestMessage] VALIDATION = WELL_FORMED_XML;
CREATE MESSAGE TYPE [//AWDB/InternalAct/ReplyMessage] VALIDATION = WELL_FORMED_XML;
GO

CREATE CONTRACT [//AWDB/InternalAct/SampleContract]
      ([//AWDB/InternalAct/RequestMessage] SENT BY INITIATOR,
       [//AWDB/InternalAct/ReplyMessage] SENT BY TARGET
      );
GO

CREATE QUEUE TargetQueueIntAct;

CREATE SERVICE [//AWDB/InternalAct/TargetService]
       ON QUEUE TargetQueueIntAct
          ([//AWDB/InternalAct/SampleContract]);
GO

CREATE QUEUE InitiatorQueueIntAct;

CREATE SERVICE [//AWDB/InternalAct/InitiatorService]
       ON QUEUE InitiatorQueueIntAct;
GO

CREATE PROCEDURE TargetActivProc
AS
  DECLARE @RecvReqDlgHandle UNIQUEIDENTIFIER;
  DECLARE @RecvReqMsg NVARCHAR(100);
  DECLARE @RecvReqMsgName sysname;

  WHILE (1=1)
  BEGIN
    BEGIN TRANSACTION;

    WAITFOR
    ( RECEIVE TOP(1)
        @RecvReqDlgHandle = conversation_handle,
        @RecvReqMsg = message_body,
        @RecvReqMsgName = message_type_name
      FROM TargetQueueIntAct
    ), TIMEOUT 5000;

    IF (@@ROWCOUNT = 0)
    BEGIN
      ROLLBACK TRANSACTION;
      BREAK;
    END

    IF @RecvReqMsgName = N'//AWDB/InternalAct/RequestMessage'
    BEGIN
       DECLARE @ReplyMsg NVARCHAR(100);
       SELECT @ReplyMsg = N'<ReplyMsg>Message for Initiator service.</ReplyMsg>';
       SEND ON CONVERSATION @RecvReqDlgHandle
              MESSAGE TYPE [//AWDB/InternalAct/ReplyMessage] (@ReplyMsg);
    END
    ELSE IF @RecvReqMsgName = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog'
    BEGIN
       END CONVERSATION @RecvReqDlgHandle;
    END

    COMMIT TRANSACTION;
  END
GO

ALTER QUEUE TargetQueueIntAct
    WITH ACTIVATION
    ( STATUS = ON,
      PROCEDURE_NAME = TargetActivProc,
      MAX_QUEUE_READERS = 10,
      EXECUTE AS SELF
    );
GO
