"""Rollout decisions (pure): the planner, progressive steps, rollback, status and its Events."""
