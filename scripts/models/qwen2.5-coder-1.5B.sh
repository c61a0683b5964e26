# Qwen2.5-Coder-1.5B-Instruct as `python -m vime_ext.models.packaged qwen2.5-coder-1.5b` builds it (untied output
# layer, QKV bias). Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 28 --hidden-size 1536 --ffn-hidden-size 8960
  --num-attention-heads 12 --group-query-attention --num-query-groups 2 --kv-channels 128 --add-qkv-bias
  --vocab-size 151936 --max-position-embeddings 32768 --rotary-base 1000000 --norm-epsilon 1e-6
  --untie-embeddings-and-output-weights
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
