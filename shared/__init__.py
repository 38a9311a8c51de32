"""What the nodes and the client share, floor by floor: the contract, the wire, the toy
world, the node floor and the client (docs/layout.md)."""
