"""nanochat's RL stage (HEAD's scripts/chat_rl.py) on TRL's GRPOTrainer: see docs/rl.md."""
