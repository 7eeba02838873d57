"""The RL core: advantage estimators and losses, rollout batches, the policy update."""
