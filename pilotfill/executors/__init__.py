"""The Parsl side: ``ElasticExecutor`` and the ``elastic_app`` decorator."""

from .decorator import elastic_app
from .elastic import ElasticExecutor

__all__ = ["ElasticExecutor", "elastic_app"]
