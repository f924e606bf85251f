"""The noisy-federation benchmark: does acting on the books train a better model, sooner?"""
