"""The cloud client libraries stay quiet in a trial's log: azure-core's per-request INFO lines are dropped (the
``azure`` logger at WARNING unless the user set its level), and an Azure error is one line that says what to
fix, never the response's raw XML body. Against Azurite (``make azurite``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers_buckets import (  # noqa: F401 (the azure_server fixture)
    azure_server_fixture,
    azurite,
    azurite_path,
    bucket_spec,
    missing_server,
)

from determined_trials.core.storage import StorageError, storage_from_spec


@pytest.fixture
def azure_logger() -> Iterator[logging.Logger]:
    """The ``azure`` logger with no level set (as in a fresh process), restored afterwards."""
    logger = logging.getLogger("azure")
    before = logger.level
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.setLevel(before)


def _azure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("azure")]


def test_azure_requests_leave_no_info_lines(azure_server: str, azure_logger: logging.Logger, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    storage = storage_from_spec(bucket_spec("azure", azure_server), default_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        storage.check()
        assert storage.list_checkpoints() == []
    assert azure_logger.level == logging.WARNING and _azure_lines(caplog) == []


def test_a_level_the_user_set_is_kept(azure_server: str, azure_logger: logging.Logger, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    azure_logger.setLevel(logging.INFO)  # someone debugging their storage wants azure-core's request lines
    storage = storage_from_spec(bucket_spec("azure", azure_server), default_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        storage.check()
    assert azure_logger.level == logging.INFO and any("Request URL" in line for line in _azure_lines(caplog))


def test_an_azurite_refusing_the_api_version_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    pytest.importorskip("azure.storage.blob")
    binary = azurite_path()
    if binary is None:
        missing_server("Azurite is not installed: run `make azurite`")
        return
    with azurite(binary, skip_api_version_check=False) as connection_string:
        storage = storage_from_spec({"type": "azure", "container": "checkpoints",
                                     "connection_string": connection_string}, default_dir=tmp_path)
        with pytest.raises(StorageError) as raised:
            storage.check()
    message = str(raised.value)
    assert "\n" not in message and "<?xml" not in message, message
    assert "is not supported by Azurite" in message and "--skipApiVersionCheck" in message, message
