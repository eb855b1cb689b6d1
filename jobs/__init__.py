"""What runs on Ray: the Ray Data stream, the Ray Train loop, the Ray Tune sweep, tokenizer
training, MLflow tracking and the command-line entry points, one package per stage (README: "How the code
is organised").

Importing the package sets the hermetic environment (`jobs.env`): offline hub, no telemetry, quiet
Ray. It must precede the first import of transformers and of ray, which read some of it at import.
"""

from jobs.env import set_hermetic_env

set_hermetic_env()
