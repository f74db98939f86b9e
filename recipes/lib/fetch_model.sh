# Sourced by the recipes' run scripts: download a Hugging Face model once into a local dir.
# Usage: fetch_model <repo id> <local dir>
fetch_model() {
  local repo=$1 dir=$2
  if [ -f "$dir/config.json" ]; then
    return
  fi
  if command -v hf >/dev/null; then
    hf download "$repo" --local-dir "$dir"
  else
    huggingface-cli download "$repo" --local-dir "$dir"
  fi
}
