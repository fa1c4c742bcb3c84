"""Model building blocks: parallel linears, embeddings, RMSNorm, RoPE, activation, attention, sampler."""
