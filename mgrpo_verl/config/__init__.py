"""Hydra YAML of our trainers (extending verl's ``ppo_trainer``) and the resolvers they use."""
