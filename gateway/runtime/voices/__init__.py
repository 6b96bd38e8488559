"""The deployment's custom voices: the folder that keeps them (store), the consent a voice needs (consent), and
the library that checks consents and clones or designs voices for the routes and sessions (library)."""
