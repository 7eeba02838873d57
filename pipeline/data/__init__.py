"""What the stages read: problem sets and the prompts built from them."""
