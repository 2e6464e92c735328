"""The command line (`main`): one thin layer over `validate.api`; its options from the models (`options`)."""
