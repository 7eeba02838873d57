"""The ML side of codepost: configs, data, sampling, algorithms, training, evaluation."""
