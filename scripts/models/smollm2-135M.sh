# SmolLM2-135M-Instruct (Llama layout, tied embeddings). Source it, then pass "${MODEL_ARGS[@]}" to train.py.
MODEL_ARGS=(
  --num-layers 30 --hidden-size 576 --ffn-hidden-size 1536
  --num-attention-heads 9 --group-query-attention --num-query-groups 3 --kv-channels 64
  --vocab-size 49152 --max-position-embeddings 8192 --rotary-base 100000 --norm-epsilon 1e-5
  --normalization RMSNorm --swiglu --disable-bias-linear --use-rotary-position-embeddings
)
