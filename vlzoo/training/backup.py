"""`BackupAndRestore`: Keras' resumable-training callback for runs over several processes.

As `keras.callbacks.BackupAndRestore` (weights, optimizer state and the epoch reached, written
to `backup_dir` each epoch or every `save_freq` batches and restored when `fit` starts again),
except that only the writing process (`vlzoo.parallel.is_writer()`: rank 0, process 0 or the
chief) writes and deletes the files, the others joining a collective save into a scratch
directory, and every process reads them. A run resumes on the number of processes it stopped
with. In a single process it is Keras' callback unchanged.

Example:
>>> backup = vlzoo.training.BackupAndRestore("runs/b16/backup")  # doctest: +SKIP
>>> model.fit(train, epochs=10, callbacks=[backup])  # run again after a crash: resumes  # doctest: +SKIP
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
