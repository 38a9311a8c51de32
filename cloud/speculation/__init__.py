"""What the cloud keeps of one request's speculation: the committed sequence, the drafts
as a tree across steps, and the structural checks of an arriving tree."""
