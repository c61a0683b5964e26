# Qwen3-0.6B (tied embeddings, QK layernorm). Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 28 --hidden-size 1024 --ffn-hidden-size 3072
  --num-attention-heads 16 --group-query-attention --num-query-groups 8 --kv-channels 128 --qk-layernorm
  --vocab-size 151936 --max-position-embeddings 40960 --rotary-base 1000000 --norm-epsilon 1e-6
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
