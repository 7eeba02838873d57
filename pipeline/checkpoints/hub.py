"""A published checkpoint to a model repository on the Hugging Face hub, as the hub's own
checkpoints are: weights, config, tokenizer, the model card (``README.md``) and the manifest
(its provenance). The trainer state stays home: it continues a codepost run, nothing on the hub
loads it. The folder is verified against its manifest first: what is pushed is what was
published."""

from __future__ import annotations

import os
from pathlib import Path

from .manifest import MANIFEST, STATE, ManifestMismatch, read_manifest, verify

TRUTHY = ("1", "ON", "YES", "TRUE")


class HubError(RuntimeError):
    """The hub refused or could not be reached: the message names the repository, the
    endpoint and what to do."""


def push_to_hub(folder: Path, repo_id: str, *, private: bool = False) -> str:
    """Upload the published checkpoint ``folder`` to the model repository ``repo_id`` (made
    when it does not exist, ``private`` then) in one commit; returns the commit's URL."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    problems = verify(folder)
    if problems:
        raise ManifestMismatch(f"{folder} does not match its {MANIFEST}: {'; '.join(problems)}")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    where = f"{repo_id} on {endpoint}"
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUTHY:
        raise HubError(f"cannot push to {where}: HF_HUB_OFFLINE is set (unset it to upload)")
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=folder,
            repo_id=repo_id,
            commit_message=f"codepost: {manifest.stage}/{manifest.version}",
            ignore_patterns=[f"{STATE}/*"],
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise HubError(
                f"cannot push to {where}: no write access for this login (HF_TOKEN, or "
                f"`hf auth login`): {status}"
            ) from None
        raise HubError(f"cannot push to {where}: {str(exc).splitlines()[0]}") from None
    except (httpx2.TransportError, OSError) as exc:  # no answer
        raise HubError(f"cannot push to {where}: no answer ({exc})") from None
    return str(commit.commit_url)
