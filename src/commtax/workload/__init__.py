"""The training step as operations (what one GPU computes and communicates) and the memory it holds."""
