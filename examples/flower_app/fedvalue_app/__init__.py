"""fedvalue-app: Flower's PyTorch app template with contributor books."""
