"""Model building blocks: parallel linears, embeddings, RMSNorm, RoPE, attention, sampler."""
