# JupyterLab settings for a workshop, read when JupyterLab starts with this folder on its config path:
#
#     JUPYTER_CONFIG_PATH="$PWD/jupyter-config" python3 -m jupyter lab --allow-root notebooks/
#
# JUPYTER_CONFIG_PATH adds this folder in front of the usual Jupyter config folders (~/.jupyter and
# the environment's), so a participant's own configuration still applies where it does not conflict.
# tests/test_jupyterlab.py starts JupyterLab this way and checks that the settings take effect.
import os

HERE = os.path.dirname(os.path.abspath(__file__))

# Default values for JupyterLab's settings, from lab/settings/overrides.json (the JupyterLab 4
# "overrides.json in the application settings directory" mechanism). A user's own change in the
# Settings Editor still wins over these. A pip-installed JupyterLab has no application settings
# directory of its own (<sys.prefix>/share/jupyter/lab/settings does not exist), so pointing it here
# hides nothing; an environment that has one should copy overrides.json there instead.
c.LabApp.app_settings_dir = os.path.join(HERE, "lab", "settings")  # noqa: F821 (c is traitlets' config)

# No request leaves the machine at start-up: no news feed and no update check on the server side
# (the frontend side, which asks the participant whether to fetch news, is off in overrides.json).
c.LabApp.news_url = None  # noqa: F821
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"  # noqa: F821
