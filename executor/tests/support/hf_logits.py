"""Logits of Hugging Face directories as transformers computes them.

Used by `llama_round_trip.rs`: each directory dsplan saved is loaded with
`AutoModelForCausalLM.from_pretrained` (weights widened to float32, eager attention) and run on
the fixture's token ids; the logits are written to OUT as one float32 tensor per directory.

    python hf_logits.py INPUTS.safetensors OUT.safetensors NAME=DIR [NAME=DIR ...]
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def main() -> None:
    inputs, out, *dirs = sys.argv[1:]
    input_ids = load_file(inputs)["input_ids"].long()
    logits = {}
    for entry in dirs:
        name, path = entry.split("=", 1)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        )
        model.eval()
        with torch.no_grad():
            logits[name] = model(input_ids=input_ids).logits.float().contiguous()
    save_file(logits, out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
