/* The Adventure Works expenses service of the CREATE MESSAGE TYPE, CREATE QUEUE and CREATE BROKER
   PRIORITY reference examples, retyped, with its routes written as kbroker's kafka:// addresses.
   Keywords in any case, "quoted" and [bracketed] names, N'...' strings. */
create xml schema collection ExpenseReport as
N'<?xml version="1.0" encoding="UTF-16" ?>
  <xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema"
     targetNamespace="http://Adventure-Works.com/Expenses"
     xmlns:expense="http://Adventure-Works.com/Expenses"
     elementFormDefault="qualified">
    <xsd:element name="ExpenseReport" />
  </xsd:schema>';
GO

CREATE MESSAGE TYPE [//Adventure-Works.com/Expenses/SubmitExpense]
    AUTHORIZATION dbo
    VALIDATION = VALID_XML WITH SCHEMA COLLECTION ExpenseReport;
create message type "//Adventure-Works.com/Expenses/ExpenseApproved" validation = empty
CREATE MESSAGE TYPE [//Adventure-Works.com/Expenses/Note]   -- validation NONE (the default)
ALTER MESSAGE TYPE [//Adventure-Works.com/Expenses/Note] VALIDATION = WELL_FORMED_XML;
GO

CREATE CONTRACT [//Adventure-Works.com/Expenses/ExpenseSubmission]
    ( [//Adventure-Works.com/Expenses/SubmitExpense] SENT BY INITIATOR,
      [//Adventure-Works.com/Expenses/ExpenseApproved] SENT BY TARGET,
      [//Adventure-Works.com/Expenses/Note] SENT BY ANY ) ;
GO

CREATE QUEUE ExpenseQueue
    WITH STATUS = OFF,
      RETENTION = ON,
      ACTIVATION (
          PROCEDURE_NAME = AdventureWorks.dbo.expense_procedure,
          MAX_QUEUE_READERS = 5,
          EXECUTE AS 'ExpenseUser' ),
      POISON_MESSAGE_HANDLING (STATUS = OFF)
    ON [PRIMARY] ;
ALTER QUEUE ExpenseQueue WITH STATUS = ON, ACTIVATION (STATUS = OFF);
CREATE QUEUE [dbo].[Expense-Replies] WITH ACTIVATION (
    STATUS = ON, PROCEDURE_NAME = [kbroker.samples.expenses:process_claims], MAX_QUEUE_READERS = 2,
    EXECUTE AS OWNER)
GO

CREATE SERVICE [//Adventure-Works.com/Expenses] ON QUEUE [dbo].[ExpenseQueue]
    ([//Adventure-Works.com/Expenses/ExpenseSubmission], [DEFAULT]);
CREATE SERVICE [//Adventure-Works.com/Employees] ON QUEUE [Expense-Replies];
GO

CREATE ROUTE ExpenseRoute
    WITH SERVICE_NAME = N'//Adventure-Works.com/Expenses',
    BROKER_INSTANCE = N'expenses',
    LIFETIME = 259200,
    ADDRESS = N'kafka://kafka1:9092,kafka2:9092/expenses',
    MIRROR_ADDRESS = N'kafka://standby:9092/expenses-mirror';
CREATE ROUTE [Local Expenses] WITH SERVICE_NAME = N'//Adventure-Works.com/Employees', ADDRESS = N'local';
GO

CREATE BROKER PRIORITY ExpensePriority
    FOR CONVERSATION
    SET (CONTRACT_NAME = [//Adventure-Works.com/Expenses/ExpenseSubmission],
         LOCAL_SERVICE_NAME = ANY,
         REMOTE_SERVICE_NAME = N'//Adventure-Works.com/Expenses',
         PRIORITY_LEVEL = 7);
GO
