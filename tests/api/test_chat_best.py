"""The chat completion's assistant message: each query's likeliest option or slot answer."""

import orjson

from api.routes.chat import _best_options


def test_best_options_cover_option_queries_grids_and_slots():
    response = {
        "results": [
            {"id": "refund", "combinations": [{"options": [{"text": " yes", "p": 0.3}, {"text": " no", "p": 0.7}]}]},
            {"id": "month", "combinations": [{"options": [], "answers": [{"text": "September", "p": 0.8}]}]},
            {"id": "grid", "combinations": [
                {"options": [{"text": " a", "p": 0.6}, {"text": " b", "p": 0.4}]},
                {"options": [], "answers": []},
            ]},
        ]
    }
    assert orjson.loads(_best_options(response)) == {"refund": " no", "month": "September", "grid": [" a", None]}
