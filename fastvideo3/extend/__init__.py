"""Extensions of the denoise step: interceptor protocols, the caching policies written on
them, their settings and validation, and the staged forward that runs them per request inside
a batch. See docs/extend.md."""
from fastvideo3.extend.protocols import BlockInterceptor, RowView, StepInterceptor
from fastvideo3.extend.settings import POLICIES, policy_names, resolve_cache, settings_key

__all__ = ["BlockInterceptor", "POLICIES", "RowView", "StepInterceptor", "policy_names", "resolve_cache",
           "settings_key"]
