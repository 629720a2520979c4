"""What ``python -m mgrpo_verl.main_ppo`` does before verl's trainer starts: the OmegaConf resolvers of our
YAML (:mod:`.resolvers`), every check that can refuse a config before any work (:mod:`.preflight`) and the
warm-start stage (:mod:`.warm_start`). The top layer: nothing in the package imports it but ``main_ppo``.
"""
