"""ipvsctl's nftables table: masquerading and hairpin for IPVS NAT traffic.

ruleset (pure: facts -> `nft -f` text), nft (the adapter that runs `nft -f -`), sync (the
service listener that keeps the table's elements in line, one transaction per batch).
"""
