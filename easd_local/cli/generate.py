"""Placeholder: commands land here."""


def register(app, models_app) -> None:
    pass
