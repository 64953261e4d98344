"""One module per detector backend, each declaring its config and registering its builder with
``models.detectors.DETECTORS``; every module here is loaded by ``models.detectors``. Heavy imports (torch,
OpenCV) stay inside the builders, so loading the config stays cheap."""
