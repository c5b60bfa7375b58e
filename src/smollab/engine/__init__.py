"""The fast path: lean Llama forward and decode, KV cache, token draws, the sampler, chunked
log-probs, the decode record and its replay, the reference. Loops call `policy` and `reference`."""
