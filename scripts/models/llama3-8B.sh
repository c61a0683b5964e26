# Meta-Llama-3-8B (untied embeddings, plain RoPE; 3.1's scaled RoPE is not supported yet).
# Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
  --vocab-size 128256 --max-position-embeddings 8192 --rotary-base 500000 --norm-epsilon 1e-5
  --untie-embeddings-and-output-weights
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
