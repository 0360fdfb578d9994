"""Write a tiny random-weight Llama and its tokenizer to a directory vLLM can serve.

Run with the vLLM venv's Python (it has transformers and tokenizers; the project venv has
neither): `python testsupport/tiny_llama.py OUT_DIR`, as `testsupport.vllm.build_tiny_llama`
does. Nothing is downloaded: the tokenizer is a word-level vocabulary trained here on a few
sentences. Sizes: hidden 128 with 2 heads gives
head_dim 64, the smallest head size vLLM's CPU attention accepts.
"""

from __future__ import annotations

import sys

WORDS = (
    "the operator scales the model server on latency . a replica serves tokens to many users . "
    "prometheus scrapes the metrics of every pod and the autoscaler reads them . "
    "time to first token grows when requests wait in the queue . more replicas share the load ."
)


def build(out_dir: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([WORDS] * 4, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(out_dir)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)


if __name__ == "__main__":
    build(sys.argv[1])
