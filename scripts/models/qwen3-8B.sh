# Qwen3-8B (untied embeddings, QK layernorm). Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 36 --hidden-size 4096 --ffn-hidden-size 12288
  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --qk-layernorm
  --vocab-size 151936 --max-position-embeddings 40960 --rotary-base 1000000 --norm-epsilon 1e-6
  --untie-embeddings-and-output-weights
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
