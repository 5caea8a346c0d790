"""Our Files and Batch wire models against the openai 3.57 wheel's own, field for field:
the same names, the same required fields, the same literal values."""

import enum
import types
import typing

import pytest
from openai.types import batch as oa_batch
from openai.types import (
    batch_create_params,
    batch_error,
    batch_list_params,
    batch_request_counts,
    batch_usage,
    file_create_params,
    file_deleted,
    file_list_params,
    file_object,
)

from contract import batches, files

PAIRS = [
    (files.FileObject, file_object.FileObject),
    (files.FileDeleted, file_deleted.FileDeleted),
    (batches.Batch, oa_batch.Batch),
    (batches.BatchErrors, oa_batch.Errors),
    (batches.BatchError, batch_error.BatchError),
    (batches.BatchRequestCounts, batch_request_counts.BatchRequestCounts),
    (batches.BatchUsage, batch_usage.BatchUsage),
    (batches.InputTokensDetails, batch_usage.InputTokensDetails),
    (batches.OutputTokensDetails, batch_usage.OutputTokensDetails),
]


def _literals(annotation) -> set:
    found = set()
    for arg in typing.get_args(annotation) or ():
        found |= _literals(arg)
    if typing.get_origin(annotation) is typing.Literal:
        found |= set(typing.get_args(annotation))
    return found


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_same_fields_as_the_wheel(ours, theirs):
    assert list(ours.model_fields) == list(theirs.model_fields)
    for name, field in theirs.model_fields.items():
        literals = _literals(field.annotation)
        if name == "status" and theirs is oa_batch.Batch:  # ours is the str enum of the same values
            assert {s.value for s in batches.BatchStatus} == literals
        elif literals and name != "object":
            assert _literals(ours.model_fields[name].annotation) == literals, name
        if field.is_required() and name != "object":  # `object` has its one value as a default
            assert ours.model_fields[name].annotation is not None and name in ours.model_fields


def _shape(annotation, ours_of: dict) -> object:
    """A comparable form of a field's type: unions as sets, Literals and str enums as their values,
    the wheel's models as ours (through PAIRS), containers with their item types."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return ("literal", frozenset(args))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return ("literal", frozenset(member.value for member in annotation))
    if origin in (typing.Union, types.UnionType):
        return frozenset(_shape(arg, ours_of) for arg in args)
    if origin in (list, dict):
        return (origin, *(_shape(arg, ours_of) for arg in args))
    return ours_of.get(annotation, annotation)


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_same_field_types_as_the_wheel(ours, theirs):
    ours_of = {their_model: our_model for our_model, their_model in PAIRS}
    for name, field in theirs.model_fields.items():
        assert _shape(ours.model_fields[name].annotation, {}) == _shape(field.annotation, ours_of), name
        if not field.is_required():  # what the SDK lets be absent, we never require
            assert not ours.model_fields[name].is_required(), name


def test_the_wheel_validates_what_we_send():
    sent = batches.Batch(id="batch_x", completion_window="24h", created_at=1, endpoint="/v1/score",
                         input_file_id="file-x", status=batches.BatchStatus.IN_PROGRESS,
                         request_counts=batches.BatchRequestCounts(completed=1, failed=0, total=2),
                         usage=batches.BatchUsage(input_tokens=3, output_tokens=0, total_tokens=3),
                         errors=batches.BatchErrors(data=[batches.BatchError(code="c", line=1)]))
    oa_batch.Batch.model_validate(sent.model_dump(mode="json", exclude_none=True), strict=True)
    shown = files.FileObject(id="file-x", bytes=3, created_at=1, filename="a.jsonl", purpose="batch")
    file_object.FileObject.model_validate(shown.model_dump(mode="json", exclude_none=True), strict=True)


def test_request_params_are_the_wheels():
    create = typing.get_type_hints(batch_create_params.BatchCreateParams, include_extras=True)
    assert set(batches.BatchCreate.model_fields) == set(create)
    required = {name for name, hint in create.items() if typing.get_origin(hint) is typing.Required}
    assert required == {n for n, f in batches.BatchCreate.model_fields.items() if f.is_required()}
    for params in (file_create_params.ExpiresAfter, batch_create_params.OutputExpiresAfter):
        hints = typing.get_type_hints(params, include_extras=True)
        assert set(hints) == set(files.ExpiresAfter.model_fields)
        assert _literals(hints["anchor"]) == _literals(files.ExpiresAfter.model_fields["anchor"].annotation)
    assert batches.BatchCreate.model_fields["output_expires_after"].annotation == files.ExpiresAfter | None
    assert _literals(create["completion_window"]) == _literals(
        batches.BatchCreate.model_fields["completion_window"].annotation)


def test_list_routes_take_the_wheels_query_params():
    from api.app import create_app
    from contract.settings import Settings

    paths = create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()["paths"]  # connects to nothing

    def query_params(path: str) -> set[str]:
        return {p["name"] for p in paths[path]["get"]["parameters"] if p["in"] == "query"}

    assert query_params("/v1/files") == set(typing.get_type_hints(file_list_params.FileListParams))
    assert query_params("/v1/batches") == set(typing.get_type_hints(batch_list_params.BatchListParams))
