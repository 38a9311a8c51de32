"""The edge's vision path, from an event window to what the models see: EventGPT's frames
and CLIP features, the feature adapter onto the target's video features, and the same
path exported to and run on ONNX Runtime."""
