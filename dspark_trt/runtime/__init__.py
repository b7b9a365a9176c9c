"""Speculative decoding: a target model, a DSpark drafter backend, and the loop between them."""
