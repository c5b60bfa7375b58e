"""The fast path: lean Llama forward and decode, KV cache, token draws, the sampler, chunked
log-probs, the decode record and its replay, the reference. A loop samples with `sampler`, scores with `policy` and `reference`."""
