"""Broken reward modules of the bad-input corpus; specs name them as `tests.bad_inputs.rewards.<module>:<function>`."""
