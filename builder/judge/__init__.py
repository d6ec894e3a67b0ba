"""The judgement of a stack with its lock: one step above lock/, the one place the
compatibility rules meet the lock's pins, in one order (judgement.py)."""
