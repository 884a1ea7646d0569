"""What kvprof runs outside itself, torch-free and above core only: nsys (locate, run, export),
the environment a child process gets, scrub, and a server kept in the background of a script."""
