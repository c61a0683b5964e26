# Qwen2.5-7B (untied embeddings, QKV bias). Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 28 --hidden-size 3584 --ffn-hidden-size 18944
  --num-attention-heads 28 --group-query-attention --num-query-groups 4 --kv-channels 128 --add-qkv-bias
  --vocab-size 152064 --max-position-embeddings 32768 --rotary-base 1000000 --norm-epsilon 1e-6
  --untie-embeddings-and-output-weights
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
