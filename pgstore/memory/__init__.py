"""The in-memory reference stores: the contract, in plain Python."""
