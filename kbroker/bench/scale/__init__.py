"""`kbroker bench scale`: open dialogs, queues and workers at growing sizes, and its plot."""
