"""config.json shapes of the real models the shipped configs name (their weights are not in the repository)."""

HF_SHAPES = {"smollm2": dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                              num_key_value_heads=3, vocab_size=49152),
             "qwen2.5-0.5b": dict(num_hidden_layers=24, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                                  num_key_value_heads=2, vocab_size=151936),
             "llama3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=16,
                                 hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                 num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                                 max_position_embeddings=131072, rope_scaling={
                                     "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                 rope_theta=500000.0),
             "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=28,
                                hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                                max_position_embeddings=40960),
             "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                                   num_hidden_layers=48, hidden_size=2048, intermediate_size=6144,
                                   moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                   norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                   vocab_size=151936, max_position_embeddings=40960, decoder_sparse_step=1,
                                   mlp_only_layers=[])}
