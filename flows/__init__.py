"""Prefect flows, tasks, deployments and schedules: the only package that imports prefect."""
