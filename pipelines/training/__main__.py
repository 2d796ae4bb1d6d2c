"""``python -m pipelines.training --config conf/X.yaml [key=value ...]``: train the experiment
the config's ``experiment:`` key names (:func:`pipelines.training.run.main`)."""
from pipelines.training.run import main

if __name__ == "__main__":
    main()
