"""`BackupAndRestore`: Keras' resumable-training callback for runs over several processes.

Keras' `keras.callbacks.BackupAndRestore` writes the model's weights, the
optimizer's state and the epoch reached to `backup_dir` at the end of each
epoch (or every `save_freq` batches), and restores them when `fit` starts
again. Launched over several processes (torchrun, JAX processes, TensorFlow
workers), every process would write the same files at once. Here only the
writing process (`vlzoo.parallel.is_writer()`: rank 0, process 0 or the chief)
writes and deletes them (where saving is collective, JAX processes and
TensorFlow workers, the others join the save into a scratch directory), and
every process reads them when `fit` starts, so a run resumes on the same number
of processes where it stopped. In a single
process it is Keras' callback unchanged.

Example:

>>> backup = vlzoo.training.BackupAndRestore("runs/b16/backup")
>>> model.fit(train, epochs=10, callbacks=[backup])   # run again after a crash: resumes
"""

import keras

from vlzoo import parallel


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore`, written by one process and read by all (module docstring).

    Args: those of `keras.callbacks.BackupAndRestore` (`backup_dir`, `save_freq`,
    `double_checkpoint`, `delete_checkpoint`).
    """

    def _save_model(self):
        """Keras' save (the weights, then the epoch reached) in the writing process; where saving is
        collective, the others save the weights to a scratch directory (`vlzoo.parallel.write_once`)."""
        if parallel.is_writer():
            super()._save_model()
        else:
            parallel.write_once(self.model.save_weights, self._weights_path)

    def on_train_end(self, logs=None):
        if parallel.is_writer():
            super().on_train_end(logs)
