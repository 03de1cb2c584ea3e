"""Dialogs: conversation endpoints, the statements that write them, messages and their validation,
conversation groups, SEND's locks and leases, dialog timers and lifetimes (pure)."""
