"""Every setting is documented, under the variable that is read: docs/service.md's settings
table names exactly the `Settings` fields, and the README, the docs and deploy/ name no
SPINF_* variable that nothing reads."""

import re
from pathlib import Path

from contract.settings import Settings

REPO = Path(__file__).resolve().parents[2]
# the converted-checkpoint cache (engine), the compose image, the client's service and key (client/)
READ_ELSEWHERE = {"SPINF_CACHE_DIR", "SPINF_IMAGE", "SPINF_BASE_URL", "SPINF_API_KEY"}


def _variables(text: str) -> set[str]:
    return set(re.findall(r"\bSPINF_[A-Z0-9_]+\b", text))


def test_the_settings_table_names_every_field():
    text = (REPO / "docs" / "service.md").read_text()
    table = text[text.index("| Setting | Default | Meaning |"):].split("\n\n")[0]
    documented = {name for row in table.splitlines()[2:] for name in _variables(row.split("|")[1])}
    assert documented == {f"SPINF_{name.upper()}" for name in Settings.model_fields}


def test_docs_and_deploy_name_only_variables_that_are_read():
    read = {f"SPINF_{name.upper()}" for name in Settings.model_fields} | READ_ELSEWHERE
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(p for p in (REPO / "deploy").rglob("*") if p.is_file())]
    for path in files:
        text = path.read_text()
        assert _variables(text) <= read, (path, _variables(text) - read)
        unprefixed = re.findall(r"(?<![A-Z_])(REDIS_URL|DEFAULT_MODEL|PACK_DIRS|DATA_DIR)=", text)
        assert not unprefixed, (path, unprefixed)
