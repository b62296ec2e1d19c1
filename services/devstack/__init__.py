"""The development stack `warmplane up` composes: the embedded parts, every service, real engines of a real
small model, a recorded trace's history, a scale-up and its proof (`job`)."""
