"""The disaggregated pool's legs: admission of a prefill and a decode slot at once, the pair of legs
(prefill then decode, or both at once), and their upstream bodies."""
