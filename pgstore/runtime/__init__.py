"""The Scheduler and the Dispatcher, and what they share."""
