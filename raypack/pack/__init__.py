"""The pack stage: config, plan, tasks, the task packer, stitching, resume, publish and the run."""
