"""Radio: analog symbol mapping, links, channel models, framing, UHD access, SigMF."""
