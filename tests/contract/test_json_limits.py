"""contract.json_limits: depth and value counts measured without recursion, stopped past the limits."""

from contract.json_limits import JsonLimits, json_limit_problem, json_shape


def test_depth_counts_containers_and_values_count_everything():
    assert json_shape({}, 32, 100) == json_shape([], 32, 100)
    assert (json_shape({}, 32, 100).depth, json_shape({}, 32, 100).num_values) == (1, 1)
    shape = json_shape({"a": [1, "x", None], "b": {}}, 32, 100)
    assert (shape.depth, shape.num_values) == (2, 6)


def test_a_value_nested_100_000_deep_is_measured_not_a_recursion_error():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    shape = json_shape(deep, 32, 10_000)
    assert shape.depth == 33  # stopped at the first level past the limit
    assert "32 levels" in json_limit_problem(deep)


def test_each_limit_is_named():
    small = JsonLimits(max_depth=2, max_values=5, max_bytes=20)
    assert json_limit_problem({"a": [1]}, small) is None
    assert "more than 2 levels" in json_limit_problem({"a": [[1]]}, small)
    assert "more than 5 values" in json_limit_problem([1, 2, 3, 4, 5], small)
    assert "more than 20" in json_limit_problem({"a": "x" * 20}, small)
    assert json_limit_problem({"a": 10**40}) is None  # an integer past 64 bits is still JSON
